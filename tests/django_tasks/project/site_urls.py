from django.http import HttpRequest, HttpResponse
from django.urls import path


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello from django")


urlpatterns = [path("hello/", hello)]
