from django.apps import apps
from django.http import HttpRequest, HttpResponse
from django.urls import path


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello from django")


urlpatterns = [path("hello/", hello)]
if apps.is_installed("django.contrib.admin"):
    from django.contrib import admin

    urlpatterns.append(path("admin/", admin.site.urls))
